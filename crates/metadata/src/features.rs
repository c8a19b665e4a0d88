//! Finalized feature levels, changed by UpdateFeatures (API 57, KIP-584, KIP-778, KIP-1022) on
//! the active controller, as Kafka 4.4's `FeatureControlManager.updateFeatures` (and
//! `ConfigurationControlManager.updateFeatures` for the ELR safety configs) decides them.
//!
//! Each update names a feature, a level and an upgrade type (UPGRADE, SAFE_DOWNGRADE,
//! UNSAFE_DOWNGRADE). The first update that fails fails the whole request with
//! INVALID_UPDATE_VERSION (95) and Kafka's message; otherwise the new levels are committed as
//! `FeatureLevelRecord`s in one batch (level 0 removes a feature; `validate_only` commits
//! nothing). A level must be supported by this controller ([`SUPPORTED_FEATURES`]), by every
//! registered broker (its `RegisterBrokerRecord` features; a feature it did not register is
//! supported at level 0 only) and by every registered controller other than this one
//! (`RegisterControllerRecord`, from `metadata.version` 3.7-IV0 on). A `metadata.version`
//! downgrade is refused when a level between the two changed the metadata format
//! ([`metadata_changed`]), other downgrades need SAFE_DOWNGRADE or UNSAFE_DOWNGRADE, and a
//! feature level that depends on a `metadata.version` (`eligible.leader.replicas.version` 1
//! needs 4.0-IV1, level 23) is refused below it.
//!
//! Departures from Kafka 4.4: gregor's controllers do not register (ControllerRegistration),
//! so a voter that has no `RegisterControllerRecord` is taken to support what this controller
//! supports, where Kafka refuses ("controller N has not registered"); `kraft.version` is the
//! quorum's (KIP-853 control records, [`ControllerConfig::kraft_version`]) and gregor does not
//! upgrade it: an upgrade to the level in force commits a `NoOpRecord` as Kafka does, an
//! upgrade to another level is refused with INVALID_UPDATE_VERSION (Kafka would upgrade the
//! quorum), a downgrade as Kafka refuses it.

use std::collections::BTreeMap;

use gregor_protocol::metadata_records::{ConfigRecord, FeatureLevelRecord, NoOpRecord};

use crate::cluster_control::SUPPORTED_FEATURES;
#[cfg(doc)]
use crate::controller::ControllerConfig;
use crate::controller::{Controller, ControllerError, ControllerResult};
// An UpdateFeatures request's types are the controller handle's; named here too, beside the rules.
pub use crate::controller::{FeatureUpdate, UpgradeType};
use crate::image::{ELR_FEATURE, METADATA_VERSION_FEATURE};
use crate::record::{ConfigResource, MetadataRecord};

/// The feature name of the KRaft protocol version (KIP-853).
pub const KRAFT_VERSION_FEATURE: &str = "kraft.version";

/// Kafka's `MetadataVersion.MINIMUM_VERSION`: 3.3-IV3, the lowest level a cluster may run.
pub const MINIMUM_METADATA_VERSION: i16 = 7;

/// The `metadata.version` levels whose metadata format differs from the level below
/// (Kafka 4.4's `MetadataVersion.didMetadataChange`): a downgrade across one of them could
/// lose metadata and is refused.
const METADATA_CHANGED_AT: &[i16] = &[8, 11, 13, 14, 17, 23, 30, 32, 33];

/// The first `metadata.version` with controller registration (3.7-IV0, KIP-919).
const MV_3_7_IV0: i16 = 15;

/// Kafka's `MetadataVersion.checkIfMetadataChanged(from, to)`: true when a level in
/// `(min, max]` of the two changed the metadata format.
pub fn metadata_changed(from: i16, to: i16) -> bool {
    let (low, high) = (from.min(to), from.max(to));
    METADATA_CHANGED_AT.iter().any(|l| *l > low && *l <= high)
}

/// Kafka's name of a `metadata.version` level (`MetadataVersion.version()`), e.g. `4.4-IV2`.
pub fn metadata_version_name(level: i16) -> Option<&'static str> {
    const NAMES: &[&str] = &[
        "3.3-IV3", "3.4-IV0", "3.5-IV0", "3.5-IV1", "3.5-IV2", "3.6-IV0", "3.6-IV1", "3.6-IV2",
        "3.7-IV0", "3.7-IV1", "3.7-IV2", "3.7-IV3", "3.7-IV4", "3.8-IV0", "3.9-IV0", "4.0-IV0",
        "4.0-IV1", "4.0-IV2", "4.0-IV3", "4.1-IV0", "4.1-IV1", "4.2-IV0", "4.2-IV1", "4.3-IV0",
        "4.4-IV0", "4.4-IV1", "4.4-IV2",
    ];
    let i = usize::try_from(level.checked_sub(MINIMUM_METADATA_VERSION)?).ok()?;
    NAMES.get(i).copied()
}

/// The `metadata.version` a feature level needs (Kafka 4.4's `FeatureVersion.dependencies`);
/// None when it needs none.
fn metadata_version_dependency(feature: &str, level: i16) -> Option<i16> {
    match (feature, level) {
        // EligibleLeaderReplicasVersion.ELRV_1 depends on 4.0-IV1.
        (ELR_FEATURE, l) if l >= 1 => Some(23),
        _ => None,
    }
}

/// Kafka's `VersionRange.toString`: `min` when equal, `min+` up to the maximum, else `min-max`.
fn range_string(min: i16, max: i16) -> String {
    if min == max {
        min.to_string()
    } else if max == i16::MAX {
        format!("{min}+")
    } else {
        format!("{min}-{max}")
    }
}

/// Kafka's `QuorumFeatures.reasonNotSupported`: why `who`, supporting `range` (None: it did
/// not register the feature, Kafka's DISABLED 0-0), cannot run `level`.
fn reason_not_supported(level: i16, who: &str, range: Option<(i16, i16)>) -> Option<String> {
    let (min, max) = range.unwrap_or((0, 0));
    if (min..=max).contains(&level) {
        None
    } else if max == 0 {
        Some(format!("{who} does not support this feature."))
    } else {
        Some(format!(
            "{who} only supports versions {}",
            range_string(min, max)
        ))
    }
}

fn invalid_update_version(feature: &str, level: i16, message: &str) -> ControllerError {
    ControllerError::InvalidUpdateVersion(format!(
        "Invalid update version {level} for feature {feature}. {message}"
    ))
}

fn invalid_metadata_version(level: i16, message: &str) -> ControllerError {
    ControllerError::InvalidUpdateVersion(format!("Invalid metadata.version {level}. {message}"))
}

impl Controller {
    /// The finalized level of `feature` (0 when not set); `metadata.version` is never 0 in a
    /// bootstrapped cluster.
    fn finalized_level(&self, feature: &str) -> i16 {
        if feature == KRAFT_VERSION_FEATURE {
            // The quorum's, not a FeatureLevelRecord (Kafka's KRaftVersionAccessor).
            return self.config.kraft_version;
        }
        self.image.features.get(feature).copied().unwrap_or(0)
    }

    /// UpdateFeatures (API 57): validates every update against the committed image as Kafka's
    /// `FeatureControlManager.updateFeatures` and answers the records to commit (none when
    /// `validate_only`). Enabling `eligible.leader.replicas.version` also sets the cluster's
    /// `min.insync.replicas` explicitly (the static value, when no cluster default is set) and
    /// removes every broker-level one (Kafka's `maybeGenerateElrSafetyRecords`, KIP-966).
    ///
    /// # Errors
    /// INVALID_UPDATE_VERSION (95) with Kafka's message, for the first update that fails: an
    /// unknown upgrade type, a negative level, a level this controller, a registered broker or
    /// controller does not support, a downgrade without a downgrade type or an "upgrade" with
    /// one, a `metadata.version` below 3.3-IV3 or unknown, a `metadata.version` downgrade
    /// across a metadata change, an unknown feature, or a missing dependency.
    pub fn update_features(
        &self,
        updates: Vec<FeatureUpdate>,
        validate_only: bool,
    ) -> Result<ControllerResult<()>, ControllerError> {
        // One update per feature, the last one of a name (the request's map key).
        let mut by_name: Vec<FeatureUpdate> = Vec::with_capacity(updates.len());
        for u in updates {
            by_name.retain(|p| p.feature != u.feature);
            by_name.push(u);
        }
        let mut proposed: BTreeMap<String, i16> = self.image.features.clone();
        for u in &by_name {
            proposed.insert(u.feature.clone(), u.max_version_level);
        }
        let mut records: Vec<MetadataRecord> = Vec::new();
        for u in &by_name {
            if let Some(record) = self.update_feature(u, &proposed)? {
                records.push(record);
            }
        }
        if validate_only {
            return Ok(ControllerResult {
                records: Vec::new(),
                response: (),
            });
        }
        if by_name
            .iter()
            .any(|u| u.feature == ELR_FEATURE && u.max_version_level > 0)
        {
            records.extend(self.elr_safety_records());
        }
        Ok(ControllerResult {
            records,
            response: (),
        })
    }

    /// One update, checked against the committed levels; its record (None: nothing to write).
    fn update_feature(
        &self,
        u: &FeatureUpdate,
        proposed: &BTreeMap<String, i16>,
    ) -> Result<Option<MetadataRecord>, ControllerError> {
        let (name, level) = (u.feature.as_str(), u.max_version_level);
        if u.upgrade_type == UpgradeType::Unknown {
            return Err(invalid_update_version(
                name,
                level,
                "The controller does not support the given upgrade type.",
            ));
        }
        let current = self.finalized_level(name);
        if level < 0 {
            return Err(invalid_update_version(
                name,
                level,
                "A feature version cannot be less than 0.",
            ));
        }
        if let Some(reason) = self.reason_not_supported(name, level) {
            return Err(invalid_update_version(name, level, &reason));
        }
        if level < current && u.upgrade_type == UpgradeType::Upgrade {
            return Err(invalid_update_version(
                name,
                level,
                "Can't downgrade the version of this feature without setting the upgrade type \
                 to either safe or unsafe downgrade.",
            ));
        }
        if level > current && u.upgrade_type != UpgradeType::Upgrade {
            return Err(invalid_update_version(
                name,
                level,
                "Can't downgrade to a newer version.",
            ));
        }
        if name == METADATA_VERSION_FEATURE {
            return self
                .update_metadata_version(level, u.upgrade_type == UpgradeType::UnsafeDowngrade);
        }
        if name == KRAFT_VERSION_FEATURE {
            if u.upgrade_type != UpgradeType::Upgrade {
                if level != current {
                    return Err(invalid_update_version(
                        name,
                        level,
                        "Can't downgrade the version of this feature.",
                    ));
                }
                return Ok(None);
            }
            if level == current {
                // Kafka's upgradeKRaftVersion to the level in force changes nothing; its
                // answer is committed as a NoOpRecord.
                return Ok(Some(NoOpRecord::default().into()));
            }
            return Err(invalid_update_version(
                name,
                level,
                "gregor does not change kraft.version through UpdateFeatures.",
            ));
        }
        if !SUPPORTED_FEATURES.iter().any(|(n, _, _)| *n == name) {
            return Err(invalid_update_version(
                name,
                level,
                &format!("Feature {name} not found."),
            ));
        }
        if let Some(needed) = metadata_version_dependency(name, level) {
            if proposed
                .get(METADATA_VERSION_FEATURE)
                .is_none_or(|mv| *mv < needed)
            {
                return Err(invalid_update_version(
                    name,
                    level,
                    &format!(
                        "{name} could not be set to {level} because it depends on \
                         metadata.version level {needed}"
                    ),
                ));
            }
        }
        Ok(Some(
            FeatureLevelRecord {
                name: name.to_string(),
                feature_level: level,
                ..FeatureLevelRecord::default()
            }
            .into(),
        ))
    }

    /// Kafka's `FeatureControlManager.reasonNotSupported`: this controller, then every
    /// registered broker, then (from 3.7-IV0) every other registered controller.
    fn reason_not_supported(&self, name: &str, level: i16) -> Option<String> {
        let local = SUPPORTED_FEATURES
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, min, max)| (*min, *max));
        let me = format!("Local controller {}", self.config.node_id);
        if let Some(reason) = reason_not_supported(level, &me, local) {
            return Some(reason);
        }
        for (id, broker) in &self.image.brokers {
            let who = format!("Broker {id}");
            if let Some(reason) = reason_not_supported(level, &who, broker.supported(name)) {
                return Some(reason);
            }
        }
        if self.image.metadata_version().unwrap_or(0) >= MV_3_7_IV0 {
            for (id, controller) in &self.image.controllers {
                if *id == self.config.node_id {
                    continue;
                }
                let range = controller
                    .features
                    .iter()
                    .find(|f| f.name == name)
                    .map(|f| (f.min_supported_version, f.max_supported_version));
                let who = format!("Controller {id}");
                if let Some(reason) = reason_not_supported(level, &who, range) {
                    return Some(reason);
                }
            }
        }
        None
    }

    /// Kafka's `FeatureControlManager.updateMetadataVersion`.
    fn update_metadata_version(
        &self,
        level: i16,
        allow_unsafe_downgrade: bool,
    ) -> Result<Option<MetadataRecord>, ControllerError> {
        let current = self.finalized_level(METADATA_VERSION_FEATURE);
        if metadata_version_name(level).is_none() {
            return Err(invalid_metadata_version(
                level,
                &format!(
                    "Valid versions are from {MINIMUM_METADATA_VERSION} to {}.",
                    SUPPORTED_FEATURES
                        .iter()
                        .find(|(n, _, _)| *n == METADATA_VERSION_FEATURE)
                        .map_or(MINIMUM_METADATA_VERSION, |(_, _, max)| *max)
                ),
            ));
        }
        if level < current {
            if metadata_changed(current, level) {
                let reason = if allow_unsafe_downgrade {
                    "Unsafe metadata downgrade is not supported in this version."
                } else {
                    "Refusing to perform the requested downgrade because it might delete \
                     metadata information."
                };
                return Err(ControllerError::InvalidUpdateVersion(format!(
                    "Unsupported metadata.version downgrade from {current} to {level}. {reason}"
                )));
            }
            tracing::warn!(from = current, to = level, "downgrading metadata.version");
        } else {
            tracing::warn!(from = current, to = level, "upgrading metadata.version");
        }
        Ok(Some(
            FeatureLevelRecord {
                name: METADATA_VERSION_FEATURE.to_string(),
                feature_level: level,
                ..FeatureLevelRecord::default()
            }
            .into(),
        ))
    }

    /// Kafka's `ConfigurationControlManager.maybeGenerateElrSafetyRecords`: the cluster-level
    /// `min.insync.replicas` set to the static value when no cluster default is set, and every
    /// broker-level `min.insync.replicas` removed, so each topic's effective value is the
    /// same on every broker once ELR is on.
    fn elr_safety_records(&self) -> Vec<MetadataRecord> {
        const MIN_ISR: &str = "min.insync.replicas";
        let mut out = Vec::new();
        let broker_config = |name: &str| {
            self.image
                .configs
                .get(&(ConfigResource::Broker, name.to_string()))
        };
        if !broker_config("").is_some_and(|c| c.contains_key(MIN_ISR)) {
            out.push(
                ConfigRecord {
                    resource_type: ConfigResource::Broker.resource_type(),
                    resource_name: String::new(),
                    name: MIN_ISR.to_string(),
                    value: Some(self.config.min_insync_replicas.to_string()),
                    ..ConfigRecord::default()
                }
                .into(),
            );
        }
        for ((resource, name), configs) in &self.image.configs {
            if *resource == ConfigResource::Broker
                && !name.is_empty()
                && configs.contains_key(MIN_ISR)
            {
                out.push(
                    ConfigRecord {
                        resource_type: ConfigResource::Broker.resource_type(),
                        resource_name: name.clone(),
                        name: MIN_ISR.to_string(),
                        value: None,
                        ..ConfigRecord::default()
                    }
                    .into(),
                );
            }
        }
        if !out.is_empty() {
            tracing::info!(
                records = out.len(),
                "ELR enabled: cluster-level min.insync.replicas"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use gregor_protocol::metadata_records::{
        BrokerFeature, ControllerFeature, RegisterBrokerRecord, RegisterControllerRecord,
    };

    use super::*;
    use crate::controller::ControllerConfig;
    use crate::image::MetadataImage;

    fn controller(mv: i16, extra: &[(&str, i16)]) -> Controller {
        let mut image = MetadataImage::default();
        image.apply(
            &FeatureLevelRecord {
                name: METADATA_VERSION_FEATURE.into(),
                feature_level: mv,
                ..FeatureLevelRecord::default()
            }
            .into(),
        );
        for (name, level) in extra {
            image.apply(
                &FeatureLevelRecord {
                    name: (*name).into(),
                    feature_level: *level,
                    ..FeatureLevelRecord::default()
                }
                .into(),
            );
        }
        for id in [1, 2, 3] {
            image.apply(&broker(id, SUPPORTED_FEATURES).into());
        }
        Controller::with_config(
            image,
            ControllerConfig {
                node_id: 1,
                min_insync_replicas: 2,
                ..ControllerConfig::default()
            },
        )
    }

    fn broker(id: i32, features: &[(&str, i16, i16)]) -> RegisterBrokerRecord {
        RegisterBrokerRecord {
            broker_id: id,
            broker_epoch: i64::from(id),
            features: features
                .iter()
                .map(|(n, min, max)| BrokerFeature {
                    name: (*n).into(),
                    min_supported_version: *min,
                    max_supported_version: *max,
                    ..BrokerFeature::default()
                })
                .collect(),
            ..RegisterBrokerRecord::default()
        }
    }

    fn update(name: &str, level: i16, t: UpgradeType) -> FeatureUpdate {
        FeatureUpdate {
            feature: name.into(),
            max_version_level: level,
            upgrade_type: t,
        }
    }

    fn refused(c: &Controller, updates: Vec<FeatureUpdate>) -> String {
        match c.update_features(updates, false) {
            Err(ControllerError::InvalidUpdateVersion(m)) => m,
            other => panic!("expected INVALID_UPDATE_VERSION, got {other:?}"),
        }
    }

    fn levels(records: &[MetadataRecord]) -> Vec<(String, i16)> {
        records
            .iter()
            .filter_map(|r| match r {
                MetadataRecord::FeatureLevel(f) => Some((f.name.clone(), f.feature_level)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_upgrade_writes_feature_level_records_and_validate_only_none() {
        let c = controller(21, &[]);
        let updates = vec![
            update(METADATA_VERSION_FEATURE, 33, UpgradeType::Upgrade),
            update("group.version", 1, UpgradeType::Upgrade),
        ];
        let r = c.update_features(updates.clone(), false).unwrap();
        assert_eq!(
            levels(&r.records),
            vec![
                (METADATA_VERSION_FEATURE.to_string(), 33),
                ("group.version".to_string(), 1)
            ]
        );
        assert!(c.update_features(updates, true).unwrap().records.is_empty());
        // The same level again is an upgrade to itself: one record, no error.
        let r = c
            .update_features(
                vec![update(METADATA_VERSION_FEATURE, 21, UpgradeType::Upgrade)],
                false,
            )
            .unwrap();
        assert_eq!(levels(&r.records).len(), 1);
    }

    #[test]
    fn downgrades_follow_kafkas_rules() {
        let c = controller(33, &[("group.version", 1)]);
        assert_eq!(
            refused(&c, vec![update("group.version", 0, UpgradeType::Upgrade)]),
            "Invalid update version 0 for feature group.version. Can't downgrade the version of \
             this feature without setting the upgrade type to either safe or unsafe downgrade."
        );
        // Disabling a feature is a safe downgrade to 0.
        let r = c
            .update_features(
                vec![update("group.version", 0, UpgradeType::SafeDowngrade)],
                false,
            )
            .unwrap();
        assert_eq!(levels(&r.records), vec![("group.version".to_string(), 0)]);
        assert_eq!(
            refused(
                &c,
                vec![update("transaction.version", 1, UpgradeType::SafeDowngrade)]
            ),
            "Invalid update version 1 for feature transaction.version. Can't downgrade to a newer \
             version."
        );
        // metadata.version: 33 changed the metadata, so 32 is refused, safe or unsafe.
        assert_eq!(
            refused(
                &c,
                vec![update(
                    METADATA_VERSION_FEATURE,
                    32,
                    UpgradeType::SafeDowngrade
                )]
            ),
            "Unsupported metadata.version downgrade from 33 to 32. Refusing to perform the \
             requested downgrade because it might delete metadata information."
        );
        assert_eq!(
            refused(
                &c,
                vec![update(
                    METADATA_VERSION_FEATURE,
                    21,
                    UpgradeType::UnsafeDowngrade
                )]
            ),
            "Unsupported metadata.version downgrade from 33 to 21. Unsafe metadata downgrade is \
             not supported in this version."
        );
        // 3.9-IV0 (21) to 3.8-IV0 (20) changed nothing: allowed.
        let c = controller(21, &[]);
        let r = c
            .update_features(
                vec![update(
                    METADATA_VERSION_FEATURE,
                    20,
                    UpgradeType::SafeDowngrade,
                )],
                false,
            )
            .unwrap();
        assert_eq!(
            levels(&r.records),
            vec![(METADATA_VERSION_FEATURE.to_string(), 20)]
        );
        assert_eq!(
            refused(
                &c,
                vec![update(
                    METADATA_VERSION_FEATURE,
                    6,
                    UpgradeType::SafeDowngrade
                )]
            ),
            "Invalid update version 6 for feature metadata.version. Local controller 1 only \
             supports versions 7-33"
        );
    }

    #[test]
    fn unsupported_levels_and_unknown_features_are_refused() {
        let c = controller(33, &[]);
        assert_eq!(
            refused(&c, vec![update("foo.version", 1, UpgradeType::Upgrade)]),
            "Invalid update version 1 for feature foo.version. Local controller 1 does not \
             support this feature."
        );
        assert_eq!(
            refused(&c, vec![update("foo.version", 0, UpgradeType::Upgrade)]),
            "Invalid update version 0 for feature foo.version. Feature foo.version not found."
        );
        assert_eq!(
            refused(&c, vec![update("group.version", 2, UpgradeType::Upgrade)]),
            "Invalid update version 2 for feature group.version. Local controller 1 only \
             supports versions 0-1"
        );
        assert_eq!(
            refused(&c, vec![update("group.version", -1, UpgradeType::Upgrade)]),
            "Invalid update version -1 for feature group.version. A feature version cannot be \
             less than 0."
        );
        assert_eq!(
            refused(&c, vec![update("group.version", 1, UpgradeType::Unknown)]),
            "Invalid update version 1 for feature group.version. The controller does not \
             support the given upgrade type."
        );
        // A broker that supports less: a broker without the feature, one with a lower range.
        let mut c = controller(21, &[]);
        c.image
            .apply(&broker(4, &[(METADATA_VERSION_FEATURE, 7, 21)]).into());
        assert_eq!(
            refused(&c, vec![update("group.version", 1, UpgradeType::Upgrade)]),
            "Invalid update version 1 for feature group.version. Broker 4 does not support this \
             feature."
        );
        assert_eq!(
            refused(
                &c,
                vec![update(METADATA_VERSION_FEATURE, 22, UpgradeType::Upgrade)]
            ),
            "Invalid update version 22 for feature metadata.version. Broker 4 only supports \
             versions 7-21"
        );
        // A registered controller (a Kafka controller in the quorum) is checked from 3.7-IV0.
        let mut c = controller(21, &[]);
        c.image.apply(
            &RegisterControllerRecord {
                controller_id: 9,
                features: vec![ControllerFeature {
                    name: METADATA_VERSION_FEATURE.into(),
                    min_supported_version: 7,
                    max_supported_version: 25,
                    ..ControllerFeature::default()
                }],
                ..RegisterControllerRecord::default()
            }
            .into(),
        );
        assert_eq!(
            refused(
                &c,
                vec![update(METADATA_VERSION_FEATURE, 26, UpgradeType::Upgrade)]
            ),
            "Invalid update version 26 for feature metadata.version. Controller 9 only supports \
             versions 7-25"
        );
        assert!(c
            .update_features(
                vec![update(METADATA_VERSION_FEATURE, 25, UpgradeType::Upgrade)],
                true
            )
            .is_ok());
    }

    #[test]
    fn elr_needs_metadata_version_4_0_iv1_and_sets_min_insync_replicas() {
        let c = controller(21, &[]);
        assert_eq!(
            refused(&c, vec![update(ELR_FEATURE, 1, UpgradeType::Upgrade)]),
            "Invalid update version 1 for feature eligible.leader.replicas.version. \
             eligible.leader.replicas.version could not be set to 1 because it depends on \
             metadata.version level 23"
        );
        // With metadata.version upgraded in the same request it is accepted.
        let mut c = controller(21, &[]);
        c.image.apply(
            &ConfigRecord {
                resource_type: ConfigResource::Broker.resource_type(),
                resource_name: "2".into(),
                name: "min.insync.replicas".into(),
                value: Some("3".into()),
                ..ConfigRecord::default()
            }
            .into(),
        );
        let r = c
            .update_features(
                vec![
                    update(METADATA_VERSION_FEATURE, 23, UpgradeType::Upgrade),
                    update(ELR_FEATURE, 1, UpgradeType::Upgrade),
                ],
                false,
            )
            .unwrap();
        let configs: Vec<(String, Option<String>)> = r
            .records
            .iter()
            .filter_map(|r| match r {
                MetadataRecord::Config(c) => Some((c.resource_name.clone(), c.value.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            configs,
            vec![(String::new(), Some("2".into())), ("2".into(), None)]
        );
        assert!(c
            .update_features(
                vec![
                    update(METADATA_VERSION_FEATURE, 23, UpgradeType::Upgrade),
                    update(ELR_FEATURE, 1, UpgradeType::Upgrade),
                ],
                true,
            )
            .unwrap()
            .records
            .is_empty());
    }

    #[test]
    fn kraft_version_is_the_quorums_and_never_changes() {
        let mut c = controller(33, &[]);
        assert_eq!(
            refused(
                &c,
                vec![update(KRAFT_VERSION_FEATURE, 1, UpgradeType::Upgrade)]
            ),
            "Invalid update version 1 for feature kraft.version. gregor does not change \
             kraft.version through UpdateFeatures."
        );
        c.config.kraft_version = 1;
        let r = c
            .update_features(
                vec![
                    update(KRAFT_VERSION_FEATURE, 1, UpgradeType::Upgrade),
                    update("group.version", 1, UpgradeType::Upgrade),
                ],
                false,
            )
            .unwrap();
        assert!(
            matches!(r.records[0], MetadataRecord::NoOp(_)),
            "{:?}",
            r.records
        );
        assert_eq!(levels(&r.records), vec![("group.version".to_string(), 1)]);
        assert_eq!(
            refused(
                &c,
                vec![update(KRAFT_VERSION_FEATURE, 0, UpgradeType::SafeDowngrade)]
            ),
            "Invalid update version 0 for feature kraft.version. Can't downgrade the version of \
             this feature."
        );
    }

    #[test]
    fn metadata_changes_match_kafkas_check() {
        assert!(metadata_changed(33, 32));
        assert!(!metadata_changed(31, 30));
        assert!(metadata_changed(31, 29));
        assert!(!metadata_changed(29, 24));
        assert!(!metadata_changed(16, 15));
        assert!(metadata_changed(9, 7));
        assert_eq!(metadata_version_name(33), Some("4.4-IV2"));
        assert_eq!(metadata_version_name(21), Some("3.9-IV0"));
        assert_eq!(metadata_version_name(6), None);
        assert_eq!(metadata_version_name(34), None);
    }
}
