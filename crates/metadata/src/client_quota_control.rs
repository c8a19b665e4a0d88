//! Client quotas on the active controller (KIP-546; Kafka's `ClientQuotaControlManager`):
//! AlterClientQuotas validated against the committed image and turned into
//! `ClientQuotaRecord`s, which every node's image applies
//! ([`crate::image::MetadataImage::client_quotas`]).
//!
//! Validation as Kafka's, every failure INVALID_REQUEST with Kafka's message: an entity has at
//! least one component, of the types `user`, `client-id` or `ip` (a name may be null, the
//! default, but not empty); `ip` is not combined with the others and names an IP address; a
//! key is one of the entity's quota keys ([`USER_CLIENT_QUOTA_KEYS`], [`IP_QUOTA_KEYS`]), its
//! value above 0 and whole for the integral keys (`producer_byte_rate`,
//! `consumer_byte_rate`: Long; `connection_creation_rate`: Int). A removal of a key the entity
//! does not have writes nothing; a value equal to the current one writes nothing.
//! The records of the whole request are committed as one batch (Kafka's `atomicOf`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::controller::{Controller, ControllerError, ControllerResult};
use crate::image::QuotaEntity;
use gregor_protocol::metadata_records::{ClientQuotaRecord, EntityData};

use crate::record::MetadataRecord;

/// Kafka's `ClientQuotaEntity.USER`.
pub const USER: &str = "user";
/// Kafka's `ClientQuotaEntity.CLIENT_ID`.
pub const CLIENT_ID: &str = "client-id";
/// Kafka's `ClientQuotaEntity.IP`.
pub const IP: &str = "ip";

/// `producer_byte_rate` (bytes/s, Long).
pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
/// `consumer_byte_rate` (bytes/s, Long).
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
/// `request_percentage` (percent of one request thread, Double; KIP-124).
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
/// `controller_mutation_rate` (partitions mutated per second, Double; KIP-599).
pub const CONTROLLER_MUTATION_RATE: &str = "controller_mutation_rate";
/// `connection_creation_rate` (connections per second per IP, Int; KIP-612).
pub const CONNECTION_CREATION_RATE: &str = "connection_creation_rate";

/// The type of a quota key's value (Kafka's `ConfigDef.Type` of `QuotaConfig`'s keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaValueType {
    /// A 64-bit integer.
    Long,
    /// A 32-bit integer.
    Int,
    /// A double.
    Double,
}

/// The keys of user and client-id entities (Kafka's `QuotaConfig.userAndClientQuotaConfigs`).
pub const USER_CLIENT_QUOTA_KEYS: &[(&str, QuotaValueType)] = &[
    (PRODUCER_BYTE_RATE, QuotaValueType::Long),
    (CONSUMER_BYTE_RATE, QuotaValueType::Long),
    (REQUEST_PERCENTAGE, QuotaValueType::Double),
    (CONTROLLER_MUTATION_RATE, QuotaValueType::Double),
];

/// The keys of ip entities (Kafka's `QuotaConfig.ipConfigs`).
pub const IP_QUOTA_KEYS: &[(&str, QuotaValueType)] =
    &[(CONNECTION_CREATION_RATE, QuotaValueType::Int)];

/// One entry of an AlterClientQuotas request.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientQuotaAlteration {
    /// The entity's components as the request lists them: (type, name or None for the
    /// default). A type listed twice keeps its last name, as Kafka's request parsing.
    pub entity: Vec<(String, Option<String>)>,
    /// (key, Some(value) to set, None to remove), in request order.
    pub ops: Vec<(String, Option<f64>)>,
}

impl ClientQuotaAlteration {
    /// The entity as the image keys it: one component per type, sorted by type.
    pub fn quota_entity(&self) -> QuotaEntity {
        let map: BTreeMap<String, Option<String>> = self.entity.iter().cloned().collect();
        map.into_iter().collect()
    }
}

fn invalid(message: impl Into<String>) -> ControllerError {
    ControllerError::InvalidRequest(message.into())
}

/// Kafka's `ClientQuotaEntity.toString`: `ClientQuotaEntity(entries={user=alice})`.
fn entity_string(entity: &QuotaEntity) -> String {
    let entries: Vec<String> = entity
        .iter()
        .map(|(t, n)| format!("{t}={}", n.as_deref().unwrap_or("null")))
        .collect();
    format!("ClientQuotaEntity(entries={{{}}})", entries.join(", "))
}

/// The quota keys an entity may have, or Kafka's error for its combination of types.
///
/// # Errors
/// INVALID_REQUEST for an empty entity, an unknown type, an empty name, `ip` combined with
/// another type, or an `ip` name that is not an IP address.
pub fn validate_entity(
    entity: &QuotaEntity,
) -> Result<&'static [(&'static str, QuotaValueType)], ControllerError> {
    if entity.is_empty() {
        return Err(invalid("Invalid empty client quota entity"));
    }
    for (entity_type, name) in entity {
        if ![USER, CLIENT_ID, IP].contains(&entity_type.as_str()) {
            return Err(invalid(format!(
                "Unhandled client quota entity type: {entity_type}"
            )));
        }
        if name.as_deref() == Some("") {
            return Err(invalid(format!("Empty {entity_type} not supported")));
        }
    }
    let has = |t: &str| entity.iter().any(|(et, _)| et == t);
    if has(IP) {
        if has(USER) || has(CLIENT_ID) {
            return Err(invalid(
                "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId",
            ));
        }
        let ip = entity
            .iter()
            .find(|(t, _)| t == IP)
            .and_then(|(_, n)| n.as_deref());
        // Kafka also accepts a resolvable host name (InetAddress.getByName); gregor does not
        // resolve names in the controller, so only IP literals and the default are valid.
        if let Some(ip) = ip {
            if ip.parse::<IpAddr>().is_err() {
                return Err(invalid(format!(
                    "{ip} is not a valid IP or resolvable host."
                )));
            }
        }
        return Ok(IP_QUOTA_KEYS);
    }
    Ok(USER_CLIENT_QUOTA_KEYS)
}

/// Kafka's `validateQuotaKeyValue`.
///
/// # Errors
/// INVALID_REQUEST for an unknown key, a value not above 0, too large for its type, or
/// fractional for an integral key.
pub fn validate_key_value(
    keys: &[(&str, QuotaValueType)],
    key: &str,
    value: f64,
) -> Result<(), ControllerError> {
    let Some((_, value_type)) = keys.iter().find(|(k, _)| *k == key) else {
        return Err(invalid(format!("Invalid configuration key {key}")));
    };
    // `!(value > 0.0)` also refuses NaN, which Kafka's `value <= 0.0` lets through.
    if value.is_nan() || value <= 0.0 {
        return Err(invalid(format!("Quota {key} must be greater than 0")));
    }
    let integral = |max: f64, what: &str| {
        if value > max {
            return Err(invalid(format!(
                "Proposed value for {key} is too large for {what}."
            )));
        }
        if (value % 1.0).abs() > 1e-6 {
            return Err(invalid(format!("{key} cannot be a fractional value.")));
        }
        Ok(())
    };
    match value_type {
        QuotaValueType::Double => Ok(()),
        QuotaValueType::Int => integral(f64::from(i32::MAX), "an INT"),
        QuotaValueType::Long => integral(i64::MAX as f64, "a LONG"),
    }
}

impl Controller {
    /// AlterClientQuotas (API 49, KIP-546): the answer per entity, in the order entities
    /// first appear in the request, and the records of every entity that validated, committed
    /// together. With `validate_only` nothing is written. As Kafka's controller: a key given
    /// twice for one entity fails it ("Duplicate quota key ..."); an entity given twice fails
    /// the second time ("Ignoring duplicate entity ...") and the answer names it once, with
    /// that error, although the first entry's records are written (Kafka's result map keeps
    /// the last answer per entity).
    pub fn alter_client_quotas(
        &self,
        alterations: Vec<ClientQuotaAlteration>,
        validate_only: bool,
    ) -> ControllerResult<Vec<(QuotaEntity, Result<(), ControllerError>)>> {
        let mut records: Vec<MetadataRecord> = Vec::new();
        let mut answers: Vec<(QuotaEntity, Result<(), ControllerError>)> = Vec::new();
        let set_answer = |answers: &mut Vec<(QuotaEntity, Result<(), ControllerError>)>,
                          entity: &QuotaEntity,
                          r: Result<(), ControllerError>| {
            match answers.iter_mut().find(|(e, _)| e == entity) {
                Some(slot) => slot.1 = r,
                None => answers.push((entity.clone(), r)),
            }
        };
        for alteration in alterations {
            let entity = alteration.quota_entity();
            let mut ops: Vec<(String, Option<f64>)> = Vec::new();
            let mut duplicate = false;
            for (key, value) in alteration.ops {
                if ops.iter().any(|(k, _)| *k == key) {
                    duplicate = true;
                    set_answer(
                        &mut answers,
                        &entity,
                        Err(invalid(format!(
                            "Duplicate quota key {key} not updating quota for this entity {}",
                            entity_string(&entity)
                        ))),
                    );
                } else {
                    ops.push((key, value));
                }
            }
            if duplicate || answers.iter().any(|(e, _)| *e == entity) {
                set_answer(
                    &mut answers,
                    &entity,
                    Err(invalid(format!(
                        "Ignoring duplicate entity {}",
                        entity_string(&entity)
                    ))),
                );
                continue;
            }
            match self.client_quota_records(&entity, &ops) {
                Ok(mut r) => {
                    records.append(&mut r);
                    set_answer(&mut answers, &entity, Ok(()));
                }
                Err(e) => set_answer(&mut answers, &entity, Err(e)),
            }
        }
        if validate_only {
            records.clear();
        }
        ControllerResult {
            records,
            response: answers,
        }
    }

    /// The records that apply `ops` to `entity` (Kafka's `alterClientQuotaEntity`).
    fn client_quota_records(
        &self,
        entity: &QuotaEntity,
        ops: &[(String, Option<f64>)],
    ) -> Result<Vec<MetadataRecord>, ControllerError> {
        let keys = validate_entity(entity)?;
        let current = self.image.client_quotas.get(entity);
        let record_entity = || -> Vec<EntityData> {
            entity
                .iter()
                .map(|(t, n)| EntityData {
                    entity_type: t.clone(),
                    entity_name: n.clone(),
                    ..EntityData::default()
                })
                .collect()
        };
        let mut records = Vec::new();
        for (key, value) in ops {
            match value {
                None => {
                    if current.is_some_and(|q| q.contains_key(key)) {
                        records.push(
                            ClientQuotaRecord {
                                entity: record_entity(),
                                key: key.clone(),
                                remove: true,
                                ..ClientQuotaRecord::default()
                            }
                            .into(),
                        );
                    }
                }
                Some(v) => {
                    validate_key_value(keys, key, *v)?;
                    if current.and_then(|q| q.get(key)) != Some(v) {
                        records.push(
                            ClientQuotaRecord {
                                entity: record_entity(),
                                key: key.clone(),
                                value: *v,
                                ..ClientQuotaRecord::default()
                            }
                            .into(),
                        );
                    }
                }
            }
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::MetadataImage;

    fn alteration(
        entity: &[(&str, Option<&str>)],
        ops: &[(&str, Option<f64>)],
    ) -> ClientQuotaAlteration {
        ClientQuotaAlteration {
            entity: entity
                .iter()
                .map(|(t, n)| (t.to_string(), n.map(str::to_string)))
                .collect(),
            ops: ops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    fn apply(c: &mut Controller, records: &[MetadataRecord]) {
        let mut image: MetadataImage = c.image.clone();
        for r in records {
            image.apply(r);
        }
        c.image = image;
    }

    fn error_message(r: &Result<(), ControllerError>) -> String {
        match r {
            Err(ControllerError::InvalidRequest(m)) => m.clone(),
            other => panic!("expected INVALID_REQUEST, got {other:?}"),
        }
    }

    #[test]
    fn set_change_and_remove_write_only_what_changes() {
        let mut c = Controller::default();
        let alice = [(USER, Some("alice")), (CLIENT_ID, None)];
        let r = c.alter_client_quotas(
            vec![alteration(
                &alice,
                &[
                    (PRODUCER_BYTE_RATE, Some(1024.0)),
                    (REQUEST_PERCENTAGE, Some(12.5)),
                ],
            )],
            false,
        );
        assert_eq!(r.records.len(), 2);
        assert!(r.response[0].1.is_ok());
        // Sorted by type: client-id before user.
        assert_eq!(
            r.response[0].0,
            vec![
                (CLIENT_ID.to_string(), None),
                (USER.to_string(), Some("alice".to_string()))
            ]
        );
        apply(&mut c, &r.records);
        let entity = r.response[0].0.clone();
        assert_eq!(c.image.client_quotas[&entity][PRODUCER_BYTE_RATE], 1024.0);

        // The same value again writes nothing; a removal of an absent key neither.
        let again = c.alter_client_quotas(
            vec![alteration(
                &alice,
                &[
                    (PRODUCER_BYTE_RATE, Some(1024.0)),
                    (CONSUMER_BYTE_RATE, None),
                ],
            )],
            false,
        );
        assert!(again.records.is_empty());
        assert!(again.response[0].1.is_ok());

        // Removing both keys removes the entity from the image.
        let gone = c.alter_client_quotas(
            vec![alteration(
                &alice,
                &[(PRODUCER_BYTE_RATE, None), (REQUEST_PERCENTAGE, None)],
            )],
            false,
        );
        assert_eq!(gone.records.len(), 2);
        apply(&mut c, &gone.records);
        assert!(c.image.client_quotas.is_empty());
    }

    #[test]
    fn validate_only_writes_nothing_but_answers() {
        let c = Controller::default();
        let r = c.alter_client_quotas(
            vec![
                alteration(
                    &[(CLIENT_ID, Some("a"))],
                    &[(PRODUCER_BYTE_RATE, Some(10.0))],
                ),
                alteration(
                    &[(CLIENT_ID, Some("b"))],
                    &[(PRODUCER_BYTE_RATE, Some(-1.0))],
                ),
            ],
            true,
        );
        assert!(r.records.is_empty());
        assert!(r.response[0].1.is_ok());
        assert_eq!(
            error_message(&r.response[1].1),
            "Quota producer_byte_rate must be greater than 0"
        );
    }

    #[test]
    fn kafkas_validation_errors() {
        let c = Controller::default();
        let cases: Vec<(ClientQuotaAlteration, &str)> = vec![
            (alteration(&[], &[(PRODUCER_BYTE_RATE, Some(1.0))]), "Invalid empty client quota entity"),
            (
                alteration(&[("group", Some("g"))], &[(PRODUCER_BYTE_RATE, Some(1.0))]),
                "Unhandled client quota entity type: group",
            ),
            (
                alteration(&[(USER, Some(""))], &[(PRODUCER_BYTE_RATE, Some(1.0))]),
                "Empty user not supported",
            ),
            (
                alteration(&[(USER, Some("u")), (IP, Some("1.2.3.4"))], &[]),
                "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId",
            ),
            (
                alteration(&[(IP, Some("not an ip"))], &[(CONNECTION_CREATION_RATE, Some(1.0))]),
                "not an ip is not a valid IP or resolvable host.",
            ),
            (
                alteration(&[(USER, Some("u"))], &[("bogus", Some(1.0))]),
                "Invalid configuration key bogus",
            ),
            (
                alteration(&[(USER, Some("u"))], &[(CONNECTION_CREATION_RATE, Some(1.0))]),
                "Invalid configuration key connection_creation_rate",
            ),
            (
                alteration(&[(IP, None)], &[(PRODUCER_BYTE_RATE, Some(1.0))]),
                "Invalid configuration key producer_byte_rate",
            ),
            (
                alteration(&[(USER, Some("u"))], &[(CONSUMER_BYTE_RATE, Some(0.0))]),
                "Quota consumer_byte_rate must be greater than 0",
            ),
            (
                alteration(&[(USER, Some("u"))], &[(PRODUCER_BYTE_RATE, Some(1.5))]),
                "producer_byte_rate cannot be a fractional value.",
            ),
            (
                alteration(&[(IP, Some("::1"))], &[(CONNECTION_CREATION_RATE, Some(3e9))]),
                "Proposed value for connection_creation_rate is too large for an INT.",
            ),
        ];
        for (a, message) in cases {
            let r = c.alter_client_quotas(vec![a.clone()], false);
            assert!(r.records.is_empty(), "{a:?}");
            assert_eq!(error_message(&r.response[0].1), message, "{a:?}");
        }
        // A fractional request_percentage is fine (Double).
        let ok = c.alter_client_quotas(
            vec![alteration(
                &[(USER, None)],
                &[(REQUEST_PERCENTAGE, Some(0.5))],
            )],
            false,
        );
        assert!(ok.response[0].1.is_ok());
        assert_eq!(ok.records.len(), 1);
    }

    #[test]
    fn duplicate_keys_and_entities_as_kafka() {
        let c = Controller::default();
        let r = c.alter_client_quotas(
            vec![
                alteration(
                    &[(CLIENT_ID, Some("a"))],
                    &[
                        (PRODUCER_BYTE_RATE, Some(1.0)),
                        (PRODUCER_BYTE_RATE, Some(2.0)),
                    ],
                ),
                alteration(
                    &[(CLIENT_ID, Some("b"))],
                    &[(PRODUCER_BYTE_RATE, Some(1.0))],
                ),
                alteration(
                    &[(CLIENT_ID, Some("b"))],
                    &[(CONSUMER_BYTE_RATE, Some(1.0))],
                ),
            ],
            false,
        );
        assert_eq!(r.response.len(), 2);
        assert_eq!(
            error_message(&r.response[0].1),
            "Ignoring duplicate entity ClientQuotaEntity(entries={client-id=a})"
        );
        assert_eq!(
            error_message(&r.response[1].1),
            "Ignoring duplicate entity ClientQuotaEntity(entries={client-id=b})"
        );
        // The first entry for b was valid and is written, as in Kafka.
        assert_eq!(r.records.len(), 1);
    }
}
